// natsbench: the NATS JetStream peer of bench/broker_vs_peers.py with a compiled client (nats.go), so that the
// server, not a Python client, sets the pace. The same flows as the nats-py tests:
//
//	publish: PublishAsync of N 100-byte records to subject "bench" with at most 4000 acks pending (stream BENCH is
//	         recreated first), then wait for every ack; prints the stream's message count.
//	fetch:   a durable pull consumer with AckAll reads N records with Fetch(10000), acknowledging the last of each batch.
//
// The result is one line of JSON: {"records": N, "seconds": S, "stored": M}. Built by the benchmark with Debian's
// golang-go and golang-github-nats-io-go-nats-dev (GO111MODULE=off GOPATH=/usr/share/gocode).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "natsbench: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	port := flag.Int("port", 4222, "nats-server port on 127.0.0.1")
	records := flag.Int("n", 1000000, "records")
	durable := flag.String("durable", "c0", "durable consumer name (fetch)")
	flag.Parse()
	if flag.NArg() != 1 {
		fail("usage: natsbench [-port P] [-n N] [-durable D] publish|fetch")
	}
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", *port))
	if err != nil {
		fail("connect: %v", err)
	}
	defer nc.Close()
	js, err := nc.JetStream(nats.PublishAsyncMaxPending(4000))
	if err != nil {
		fail("jetstream: %v", err)
	}
	result := map[string]interface{}{"records": *records}
	switch flag.Arg(0) {
	case "publish":
		_ = js.DeleteStream("BENCH")
		if _, err := js.AddStream(&nats.StreamConfig{Name: "BENCH", Subjects: []string{"bench"}, Storage: nats.FileStorage}); err != nil {
			fail("add stream: %v", err)
		}
		value := bytes.Repeat([]byte("x"), 100)
		start := time.Now()
		for i := 0; i < *records; i++ {
			if _, err := js.PublishAsync("bench", value); err != nil {
				fail("publish: %v", err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(300 * time.Second):
			fail("acks still pending after 300 s")
		}
		result["seconds"] = time.Since(start).Seconds()
		info, err := js.StreamInfo("BENCH")
		if err != nil {
			fail("stream info: %v", err)
		}
		result["stored"] = info.State.Msgs
	case "fetch":
		start := time.Now()
		sub, err := js.PullSubscribe("bench", *durable, nats.BindStream("BENCH"), nats.AckAll(), nats.MaxAckPending(-1),
			nats.DeliverAll())
		if err != nil {
			fail("pull subscribe: %v", err)
		}
		received := 0
		for received < *records {
			msgs, err := sub.Fetch(10000, nats.MaxWait(5*time.Second))
			if err != nil {
				fail("fetch after %d records: %v", received, err)
			}
			received += len(msgs)
			if err := msgs[len(msgs)-1].Ack(); err != nil {
				fail("ack: %v", err)
			}
		}
		result["seconds"] = time.Since(start).Seconds()
		result["records"] = received
	default:
		fail("unknown flow %q", flag.Arg(0))
	}
	out, _ := json.Marshal(result)
	fmt.Println(string(out))
}
