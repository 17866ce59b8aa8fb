// Package tracked is the connector's record of a thread it tracks (started or adopted through
// it). The store keeps these records (store.Thread is this type); the type lives in a package
// of its own, importing nothing of the module, so that its readers (internal/tools,
// internal/fleet) read tracked threads without importing the store.
package tracked

import "time"

// Thread is a thread the connector tracks.
type Thread struct {
	ID            string    `json:"id"`
	Machine       string    `json:"machine"`
	ProjectID     string    `json:"projectId,omitempty"`
	ProjectTitle  string    `json:"projectTitle,omitempty"`
	Title         string    `json:"title,omitempty"`
	Origin        string    `json:"origin,omitempty"`
	Watch         bool      `json:"watch,omitempty"`
	LastMessageID string    `json:"lastMessageId,omitempty"` // our last dispatched message id (set once T3 accepted it)
	LastRunID     string    `json:"lastRunId,omitempty"`     // the run T3 made of it, when the row showed it
	CreatedAt     time.Time `json:"createdAt"`
	UpdatedAt     time.Time `json:"updatedAt"`
}
