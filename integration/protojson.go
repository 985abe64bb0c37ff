package integration

import (
	"go.temporal.io/api/history/v1"
	"google.golang.org/protobuf/encoding/protojson"
)

func protojsonMarshal(e *history.HistoryEvent) ([]byte, error) {
	return protojson.Marshal(e)
}
