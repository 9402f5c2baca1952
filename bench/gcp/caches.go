package main

// The two go-control-plane caches a peer can serve from, and how a trigger's changes
// reach each: the LinearCache (one per type, an update wakes only the watches on the
// changed names) and the SnapshotCache (a whole new snapshot per change, diffed per
// stream by resource hashes).

import (
	"context"
	"fmt"
	"strconv"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// servedTypes are the types pilot sends over ADS; a stream may ask for any of them, even
// one the recorded responses hold none of.
var servedTypes = []string{
	resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType,
}

// store is a peer's cache: what the xDS server watches, and how changes reach it.
type store interface {
	watched() cache.Cache
	update(changes []delta) error
}

// newStore builds the cache of this kind holding the initial state.
func newStore(kind string, initial state) (store, error) {
	for typeURL := range initial {
		if !served(typeURL) {
			return nil, fmt.Errorf("resources of type %s: not served over ADS here", typeURL)
		}
	}
	switch kind {
	case "linear":
		return newLinearStore(initial), nil
	case "snapshot":
		return newSnapshotStore(initial)
	}
	return nil, fmt.Errorf("-cache %q: linear or snapshot", kind)
}

func served(typeURL string) bool {
	for _, known := range servedTypes {
		if typeURL == known {
			return true
		}
	}
	return false
}

// linearStore is one LinearCache per type behind a MuxCache keyed by type URL: how
// go-control-plane's own integration server pairs its EDS LinearCache with other types.
type linearStore struct {
	caches map[string]*cache.LinearCache
	mux    *cache.MuxCache
}

func newLinearStore(initial state) *linearStore {
	caches := make(map[string]*cache.LinearCache, len(servedTypes))
	muxed := make(map[string]cache.Cache, len(servedTypes))
	for _, typeURL := range servedTypes {
		linear := cache.NewLinearCache(typeURL, cache.WithInitialResources(initial[typeURL]))
		caches[typeURL], muxed[typeURL] = linear, linear
	}
	mux := &cache.MuxCache{
		Classify:      func(request *cache.Request) string { return request.GetTypeUrl() },
		ClassifyDelta: func(request *cache.DeltaRequest) string { return request.GetTypeUrl() },
		Caches:        muxed,
	}
	return &linearStore{caches: caches, mux: mux}
}

func (l *linearStore) watched() cache.Cache { return l.mux }

// update hands each type's changed and removed resources to its cache in one call, which
// wakes only the watches on those names; a later change of the same name wins.
func (l *linearStore) update(changes []delta) error {
	updated := state{}
	removed := map[string]map[string]bool{}
	for _, change := range changes {
		typeURL := change.typeURL
		updated.apply(delta{typeURL: typeURL, updated: change.updated, removed: change.removed})
		if removed[typeURL] == nil {
			removed[typeURL] = map[string]bool{}
		}
		for name := range change.updated {
			delete(removed[typeURL], name)
		}
		for _, name := range change.removed {
			removed[typeURL][name] = true
		}
	}
	for typeURL, names := range removed {
		gone := make([]string, 0, len(names))
		for name := range names {
			gone = append(gone, name)
		}
		if err := l.caches[typeURL].UpdateResources(updated[typeURL], gone); err != nil {
			return fmt.Errorf("%s: %w", typeURL, err)
		}
	}
	return nil
}

// meshKey is the SnapshotCache's one node key: every client is served the same
// snapshot, as users of go-control-plane do when all proxies get one configuration.
const meshKey = "mesh"

// oneKey is the node hash that maps every node to meshKey, so one SetSnapshot per change
// reaches every stream, whichever node id it gave (and before it connects).
type oneKey struct{}

func (oneKey) ID(*core.Node) string { return meshKey }

// snapshotStore keeps the whole state and sets a new snapshot of it per change.
type snapshotStore struct {
	cache   cache.SnapshotCache
	state   state
	version int
}

func newSnapshotStore(initial state) (*snapshotStore, error) {
	// ads=false, as go-control-plane's example server: for delta streams the flag only
	// orders the watches answered on each SetSnapshot by type.
	s := &snapshotStore{cache: cache.NewSnapshotCache(false, oneKey{}, nil), state: initial}
	return s, s.set()
}

func (s *snapshotStore) watched() cache.Cache { return s.cache }

func (s *snapshotStore) update(changes []delta) error {
	for _, change := range changes {
		s.state.apply(change)
	}
	return s.set()
}

// set builds a snapshot of the whole state under the next version and sets it.
func (s *snapshotStore) set() error {
	s.version++
	resources := make(map[resource.Type][]types.Resource, len(s.state))
	for typeURL, held := range s.state {
		list := make([]types.Resource, 0, len(held))
		for _, item := range held {
			list = append(list, item)
		}
		resources[typeURL] = list
	}
	snapshot, err := cache.NewSnapshot(strconv.Itoa(s.version), resources)
	if err != nil {
		return err
	}
	return s.cache.SetSnapshot(context.Background(), meshKey, snapshot)
}
