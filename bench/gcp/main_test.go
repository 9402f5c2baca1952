package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	stream "github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// assignment is a recorded EDS response carrying one assignment, under `name`.
func assignment(t *testing.T, name, cluster string) []byte {
	t.Helper()
	packed, err := anypb.New(&endpoint.ClusterLoadAssignment{ClusterName: cluster})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := proto.Marshal(&discovery.DeltaDiscoveryResponse{
		TypeUrl:   resource.EndpointType,
		Resources: []*discovery.Resource{{Name: name, Resource: packed}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// capture writes records as bench/wire.py does, then `tail` bytes more.
func capture(t *testing.T, records [][]byte, tail []byte) string {
	t.Helper()
	var data []byte
	for _, record := range records {
		data = binary.BigEndian.AppendUint32(data, uint32(len(record)))
		data = append(data, record...)
	}
	path := filepath.Join(t.TempDir(), "records.bin")
	if err := os.WriteFile(path, append(data, tail...), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRecordsRoundTrip(t *testing.T) {
	deltas, err := readDeltas(capture(t, [][]byte{assignment(t, "a", "a"), assignment(t, "b", "b")}, nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(deltas) != 2 || deltas[1].typeURL != resource.EndpointType || deltas[1].updated["b"] == nil {
		t.Fatalf("decoded %+v", deltas)
	}
}

func TestTruncatedCaptureIsNoData(t *testing.T) {
	whole := assignment(t, "a", "a")
	for _, tail := range [][]byte{{0, 0}, {0, 0, 0, 9, 1}} {
		_, err := readDeltas(capture(t, [][]byte{whole}, tail))
		if err == nil || !strings.Contains(err.Error(), "record 1") {
			t.Errorf("tail %v: got %v, want an error naming record 1", tail, err)
		}
	}
}

func TestEmptyInitialRefused(t *testing.T) {
	empty := capture(t, nil, nil)
	_, _, err := load(options{kind: "linear", initial: empty, changes: empty})
	if err == nil || !strings.Contains(err.Error(), "no resources") {
		t.Fatalf("got %v, want no resources", err)
	}
}

func TestResourceUnderAnotherNameRefused(t *testing.T) {
	_, err := readDeltas(capture(t, [][]byte{assignment(t, "a", "b")}, nil))
	if err == nil || !strings.Contains(err.Error(), `"a" names itself "b"`) {
		t.Fatalf("got %v", err)
	}
}

// counting is a store that keeps what it was asked to apply.
type counting struct{ applied [][]delta }

func (c *counting) watched() cache.Cache { return nil }

func (c *counting) update(changes []delta) error {
	c.applied = append(c.applied, changes)
	return nil
}

func TestBadTriggerLinesSkipped(t *testing.T) {
	changes := []delta{{typeURL: "zero"}, {typeURL: "one"}}
	applied := &counting{}
	input := strings.NewReader("x\n2\n-1\n1 0\n\n1 7\n")
	if err := readTriggers(input, applied, changes); err != nil {
		t.Fatal(err)
	}
	// "x", "2", "-1" and "1 7" name no change: skipped whole; the empty line names none.
	if len(applied.applied) != 1 || len(applied.applied[0]) != 2 {
		t.Fatalf("applied %+v", applied.applied)
	}
	if applied.applied[0][0].typeURL != "one" || applied.applied[0][1].typeURL != "zero" {
		t.Fatalf("applied %+v, want changes 1 then 0", applied.applied[0])
	}
}

// A change reaches a stream subscribed to it, whatever node id the stream gave: the
// snapshot cache's one key serves every node.
func TestChangeReachesSubscriber(t *testing.T) {
	records := [][]byte{assignment(t, "a", "a"), assignment(t, "b", "b")}
	deltas, err := readDeltas(capture(t, records, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"linear", "snapshot"} {
		held := state{}
		held.apply(deltas[0])
		cached, err := newStore(kind, held)
		if err != nil {
			t.Fatal(err)
		}
		request := &discovery.DeltaDiscoveryRequest{
			Node:                   &core.Node{Id: "sidecar~10.0.0.1~any.default~cluster.local"},
			TypeUrl:                resource.EndpointType,
			ResourceNamesSubscribe: []string{"b"},
		}
		sub := stream.NewDeltaSubscription([]string{"b"}, nil, nil, false)
		answers := make(chan cache.DeltaResponse, 1)
		if _, err := cached.watched().CreateDeltaWatch(request, sub, answers); err != nil {
			t.Fatal(err)
		}
		if len(answers) != 0 {
			t.Fatalf("%s: answered before b existed", kind)
		}
		if err := cached.update(deltas[1:]); err != nil {
			t.Fatal(err)
		}
		if len(answers) != 1 {
			t.Fatalf("%s: no answer once b was set", kind)
		}
		response, err := (<-answers).GetDeltaDiscoveryResponse()
		if err != nil || len(response.GetResources()) != 1 || response.GetResources()[0].GetName() != "b" {
			t.Fatalf("%s: answered %v (%v)", kind, response, err)
		}
	}
}

func TestUnknownCacheRefused(t *testing.T) {
	if _, err := newStore("other", state{}); err == nil {
		t.Fatal("-cache other: accepted")
	}
}
