package main

// The capture files the bench writes (bench/wire.py): each record a 4-byte big-endian
// length and one DeltaDiscoveryResponse as a client received it from pilot. This file
// turns them into typed Envoy resources, once, before the server starts.

import (
	"encoding/binary"
	"fmt"
	"os"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// delta is what one recorded response changes: of one type, resources set and removed.
type delta struct {
	typeURL string
	updated map[string]types.Resource
	removed []string
}

// readRecords returns the records of a capture file; a record cut short is an error, so
// a truncated file never counts as data.
func readRecords(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var records [][]byte
	for offset := 0; offset < len(data); {
		if len(data)-offset < 4 {
			return nil, fmt.Errorf("%s: record %d: length cut short", path, len(records))
		}
		size := int(binary.BigEndian.Uint32(data[offset:]))
		offset += 4
		if size > len(data)-offset {
			return nil, fmt.Errorf("%s: record %d: %d bytes announced, %d left",
				path, len(records), size, len(data)-offset)
		}
		records = append(records, data[offset:offset+size])
		offset += size
	}
	return records, nil
}

// decodeResponse turns one recorded response into typed resources, each checked to carry
// the name the response gave it (the caches index resources by their own name).
func decodeResponse(raw []byte) (delta, error) {
	response := &discovery.DeltaDiscoveryResponse{}
	if err := proto.Unmarshal(raw, response); err != nil {
		return delta{}, fmt.Errorf("not a DeltaDiscoveryResponse: %w", err)
	}
	found := delta{
		typeURL: response.GetTypeUrl(),
		updated: make(map[string]types.Resource, len(response.GetResources())),
		removed: response.GetRemovedResources(),
	}
	for _, wrapped := range response.GetResources() {
		message, err := anypb.UnmarshalNew(wrapped.GetResource(), proto.UnmarshalOptions{})
		if err != nil {
			return delta{}, fmt.Errorf("resource %q: %w", wrapped.GetName(), err)
		}
		if name := cache.GetResourceName(message); name != wrapped.GetName() {
			return delta{}, fmt.Errorf("resource %q names itself %q", wrapped.GetName(), name)
		}
		found.updated[wrapped.GetName()] = message
	}
	return found, nil
}

// readDeltas decodes every record of a capture file.
func readDeltas(path string) ([]delta, error) {
	records, err := readRecords(path)
	if err != nil {
		return nil, err
	}
	deltas := make([]delta, len(records))
	for i, raw := range records {
		if deltas[i], err = decodeResponse(raw); err != nil {
			return nil, fmt.Errorf("%s: record %d: %w", path, i, err)
		}
	}
	return deltas, nil
}

// state is every resource by type URL and name.
type state map[string]map[string]types.Resource

// apply sets and removes what one response changes.
func (s state) apply(change delta) {
	held := s[change.typeURL]
	if held == nil {
		held = make(map[string]types.Resource, len(change.updated))
		s[change.typeURL] = held
	}
	for name, resource := range change.updated {
		held[name] = resource
	}
	for _, name := range change.removed {
		delete(held, name)
	}
}

// count is how many resources the state holds.
func (s state) count() int {
	total := 0
	for _, held := range s {
		total += len(held)
	}
	return total
}
