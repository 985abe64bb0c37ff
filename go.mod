module github.com/durabletrain/durabletrain

go 1.26.8

require (
	go.uber.org/zap v1.28.0
	gonum.org/v1/gonum v0.17.0
)

require go.uber.org/multierr v1.11.0 // indirect
