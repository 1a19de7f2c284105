package discovery

import "testing"

// BenchmarkDiscover8GPUMockNode measures one discovery pass of an 8-GPU
// mock node (the mock is built once; only Discover is timed).
func BenchmarkDiscover8GPUMockNode(b *testing.B) {
	for _, spec := range []string{"mock:dgxa100", "mock:dgxa100:mig"} {
		b.Run(spec, func(b *testing.B) {
			be, err := OpenBackend(spec, "bench", "")
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				inv, err := Discover(be.Lib, Options{})
				if err != nil || len(inv.GPUs) != 8 {
					b.Fatalf("%v %v", inv, err)
				}
			}
		})
	}
}
