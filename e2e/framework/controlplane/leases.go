package controlplane

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// RenewLease sets a Lease's renewTime to now, as its holder's heartbeat
// does (the suites stand in for agents that hold them).
func RenewLease(ctx context.Context, c kubernetes.Interface, namespace, name string) error {
	patch := fmt.Sprintf(`{"spec":{"renewTime":%q}}`, metav1.NowMicro().Format(metav1.RFC3339Micro))
	_, err := c.CoordinationV1().Leases(namespace).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}
