// Command gcp is the bench's go-control-plane peer: a delta ADS server on
// go-control-plane v0.14 serving the resources pilot sent in the same run, so the bench
// can set pilot, its grpc.aio floor and go-control-plane side by side.
//
//	gcp -cache linear|snapshot -initial FILE -changes FILE [-host H] [-port P]
//
// -initial and -changes are the floor's capture files (bench/wire.py): the responses of
// one client's initial sync, and one response per change. Both are decoded into typed
// Envoy resources before serving. The initial ones fill the cache; each line `K` (or
// `K L ...`) on standard input applies change K (then L, ...) to it:
//
//   - linear: one LinearCache per type (behind a MuxCache); a change is UpdateResources
//     of the changed names, which wakes only the watches on them.
//   - snapshot: a SnapshotCache whose node hash maps every node to one key; a change is a
//     new snapshot of the whole state under the next version, set once for that key.
//
// Prints `gcp listening on PORT` once serving; a bad line on standard input is reported
// on standard error and skipped. Stops when standard input closes or on SIGTERM/SIGINT.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"google.golang.org/grpc"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	server "github.com/envoyproxy/go-control-plane/pkg/server/v3"
)

// maxReceive is pilot's own bound on a request (grpc.max_receive_message_length).
const maxReceive = 1 << 24

type options struct {
	kind, initial, changes, host string
	port                         int
}

func parseFlags(args []string) (options, error) {
	var o options
	flags := flag.NewFlagSet("gcp", flag.ContinueOnError)
	flags.StringVar(&o.kind, "cache", "linear", "linear or snapshot")
	flags.StringVar(&o.initial, "initial", "", "responses of the initial sync (capture file)")
	flags.StringVar(&o.changes, "changes", "", "one response per change (capture file)")
	flags.StringVar(&o.host, "host", "127.0.0.1", "address to listen on")
	flags.IntVar(&o.port, "port", 0, "port to listen on (0: any free one)")
	if err := flags.Parse(args); err != nil {
		return o, err
	}
	if o.initial == "" || o.changes == "" {
		return o, errors.New("-initial and -changes are required")
	}
	return o, nil
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("gcp: ")
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		log.Print(err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

// load decodes both files and builds the cache holding the initial state.
func load(o options) (store, []delta, error) {
	initial, err := readDeltas(o.initial)
	if err != nil {
		return nil, nil, err
	}
	changes, err := readDeltas(o.changes)
	if err != nil {
		return nil, nil, err
	}
	held := state{}
	for _, response := range initial {
		held.apply(response)
	}
	if held.count() == 0 {
		return nil, nil, fmt.Errorf("%s: no resources", o.initial)
	}
	for i, change := range changes {
		if !served(change.typeURL) {
			return nil, nil, fmt.Errorf("%s: record %d: type %s not served", o.changes, i, change.typeURL)
		}
	}
	cached, err := newStore(o.kind, held)
	return cached, changes, err
}

func run(o options) error {
	cached, changes, err := load(o)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	listener, err := net.Listen("tcp", net.JoinHostPort(o.host, strconv.Itoa(o.port)))
	if err != nil {
		return err
	}
	grpcServer := grpc.NewServer(grpc.MaxRecvMsgSize(maxReceive))
	xds := server.NewServer(ctx, cached.watched(), nil)
	discovery.RegisterAggregatedDiscoveryServiceServer(grpcServer, xds)
	served := make(chan error, 1)
	go func() { served <- grpcServer.Serve(listener) }()
	fmt.Printf("gcp listening on %d\n", listener.Addr().(*net.TCPAddr).Port)

	triggers := make(chan error, 1)
	go func() { triggers <- readTriggers(os.Stdin, cached, changes) }()
	select {
	case <-ctx.Done():
	case err = <-triggers:
	case err = <-served:
	}
	grpcServer.Stop()
	return err
}

// readTriggers applies each line's changes until input ends (nil) or cannot be read.
func readTriggers(input io.Reader, cached store, changes []delta) error {
	lines := bufio.NewScanner(input)
	for lines.Scan() {
		picked, err := pick(lines.Text(), changes)
		if err == nil && len(picked) > 0 {
			err = cached.update(picked)
		}
		if err != nil {
			log.Printf("standard input %q: %v (skipped)", lines.Text(), err)
		}
	}
	return lines.Err()
}

// pick is the changes a line names, in its order.
func pick(line string, changes []delta) ([]delta, error) {
	fields := strings.Fields(line)
	picked := make([]delta, 0, len(fields))
	for _, field := range fields {
		index, err := strconv.Atoi(field)
		if err != nil || index < 0 || index >= len(changes) {
			return nil, fmt.Errorf("%q: not a change (0 to %d)", field, len(changes)-1)
		}
		picked = append(picked, changes[index])
	}
	return picked, nil
}
