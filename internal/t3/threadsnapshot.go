package t3

import "bytes"

// TrimThreadSnapshot trims a subscribeThread snapshot item
// ({"kind":"snapshot","snapshotSequence":…,"projection":{…},…}) to the part k
// keeps, exactly as ThreadRecentKeep trims the bounded read (Keep): the other
// keys of the item are kept as T3 sent them, the projection's runs, messages,
// checkpoints, requests and timeline rows are filtered without being decoded.
// runs is how many runs the thread has in all. A t3_wait keeps its thread
// current from this stream (internal/threadfeed), so a snapshot of a long
// thread costs what the result's bounded read used to cost, not more.
func TrimThreadSnapshot(item []byte, k Keep) (trimmed []byte, runs int, err error) {
	return trimBoundedFrom(bytes.NewReader(item), k, 0, nil)
}
