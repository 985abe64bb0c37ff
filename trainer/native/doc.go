// Package native is the default trainer backend: a multi-layer perceptron
// (784-256-128-10 with ReLU and softmax cross-entropy unless configured
// otherwise) trained with SGD with momentum or Adam, in float32 on gonum's
// BLAS interface. Built with -tags openblas, matrix products go to OpenBLAS
// through cgo (gonum.org/v1/netlib); otherwise gonum's pure-Go kernels run.
// BLAS() says which. Initialisation and optimizer updates follow PyTorch's
// definitions so that figures compare with torch.nn.Linear and torch.optim.
package native
