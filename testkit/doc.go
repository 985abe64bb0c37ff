// Package testkit holds what exists only for tests and benchmarks, apart
// from the product: a simulated fleet (simfleet), the embedded Temporal dev
// server (devserver, also behind cmd/devserver), a real MinIO and the faults
// put in front of it (minio, faultproxy), the malformed-input corpus
// (speccorpus), test data (testdata) and the spec reference's generator
// (specdoc). Nothing the workers ship imports it: only tests, bench/ and
// cmd/devserver do (the layering test in package testkit checks it).
package testkit
