package workflows

import (
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"
)

// converterDecode reads the first argument of a continue-as-new.
func converterDecode(can *workflow.ContinueAsNewError, out any) error {
	return converter.GetDefaultDataConverter().FromPayloads(can.Input, out)
}
