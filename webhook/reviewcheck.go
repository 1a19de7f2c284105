package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// maxReviewBytes bounds what requireRequest reads: the limit controller-runtime
// applies to an admission body. The API server stores objects of up to 3 MiB,
// so a review (object and oldObject) stays under it.
const maxReviewBytes = 7 << 20

// reviewHead is the part of an AdmissionReview without which there is nothing
// to decide.
type reviewHead struct {
	Request *struct {
		UID       string `json:"uid"`
		Operation string `json:"operation"`
		Kind      struct {
			Kind string `json:"kind"`
		} `json:"kind"`
	} `json:"request"`
}

// requireRequest answers HTTP 400, and no admission verdict, to a body that is
// not an AdmissionReview with a request naming its uid, operation and kind. The
// API server never sends one; anything else that does gets an error, not an
// "allowed" answer with an empty uid.
func requireRequest(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil {
			http.Error(w, "admission review: empty body", http.StatusBadRequest)
			return
		}
		body, err := readReview(r)
		if err != nil {
			http.Error(w, "admission review: reading the body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(body) > maxReviewBytes {
			// An HTTP error, not controller-runtime's "errored" verdict, so
			// that the failure policy decides.
			http.Error(w, fmt.Sprintf("admission review: over %d bytes", maxReviewBytes), http.StatusRequestEntityTooLarge)
			return
		}
		if msg := reviewProblem(body); msg != "" {
			http.Error(w, "admission review: "+msg, http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// readReview is a review's body, at most one byte past maxReviewBytes:
// the one the gate has read already, or read here.
func readReview(r *http.Request) ([]byte, error) {
	defer r.Body.Close()
	if b, ok := r.Body.(bufferedBody); ok {
		return b.data, nil
	}
	return io.ReadAll(io.LimitReader(r.Body, maxReviewBytes+1))
}

// reviewProblem says what an AdmissionReview body lacks, or "" when it has
// what a decision needs.
func reviewProblem(body []byte) string {
	var head reviewHead
	if err := json.Unmarshal(body, &head); err != nil {
		return "not JSON: " + err.Error()
	}
	if head.Request == nil {
		return "no request"
	}
	var missing []string
	for _, f := range []struct{ name, value string }{
		{"request.uid", head.Request.UID}, {"request.operation", head.Request.Operation}, {"request.kind.kind", head.Request.Kind.Kind},
	} {
		if f.value == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Sprintf("missing %s", strings.Join(missing, ", "))
	}
	return ""
}
