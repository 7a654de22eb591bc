// Command otlpsink is a real OTLP/HTTP trace receiver for the tests: it
// accepts POST /v1/traces in protobuf (gzip or not), decodes each request
// with the official opentelemetry-proto definitions
// (go.opentelemetry.io/proto/otlp) and appends one JSON line per span to
// -out. It prints "listening <addr>" once it accepts connections.
//
// A request is decoded as a TracesData, the message the OTLP protocol
// defines to be wire-compatible with ExportTraceServiceRequest (the same
// field 1, repeated ResourceSpans), and answered with an empty
// ExportTraceServiceResponse (no fields set: zero bytes). The collector
// package that declares those two would also bring gRPC and its gateway
// into the build, which on a new machine cost more than every other peer.
//
//	otlpsink -addr 127.0.0.1:0 -out spans.jsonl
package main

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sync"

	common "go.opentelemetry.io/proto/otlp/common/v1"
	trace "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

type link struct {
	TraceID string `json:"trace_id"`
	SpanID  string `json:"span_id"`
}

type span struct {
	Service      string         `json:"service"`
	Scope        string         `json:"scope"`
	TraceID      string         `json:"trace_id"`
	SpanID       string         `json:"span_id"`
	ParentSpanID string         `json:"parent_span_id"`
	Name         string         `json:"name"`
	Kind         string         `json:"kind"`
	StartNanos   uint64         `json:"start_unix_nanos"`
	EndNanos     uint64         `json:"end_unix_nanos"`
	Attributes   map[string]any `json:"attributes"`
	Links        []link         `json:"links"`
	Status       string         `json:"status"`
	StatusText   string         `json:"status_message"`
	Events       []string       `json:"events"`
}

func value(v *common.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *common.AnyValue_StringValue:
		return x.StringValue
	case *common.AnyValue_IntValue:
		return x.IntValue
	case *common.AnyValue_BoolValue:
		return x.BoolValue
	case *common.AnyValue_DoubleValue:
		return x.DoubleValue
	default:
		return fmt.Sprint(v)
	}
}

func attributes(kvs []*common.KeyValue) map[string]any {
	out := map[string]any{}
	for _, kv := range kvs {
		out[kv.GetKey()] = value(kv.GetValue())
	}
	return out
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	out := flag.String("out", "spans.jsonl", "file the spans are appended to")
	flag.Parse()

	file, err := os.OpenFile(*out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex

	http.HandleFunc("/v1/traces", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
			http.Error(w, "want application/x-protobuf, got "+ct, http.StatusUnsupportedMediaType)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		raw, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var request trace.TracesData
		if err := proto.Unmarshal(raw, &request); err != nil {
			http.Error(w, "not an ExportTraceServiceRequest: "+err.Error(), http.StatusBadRequest)
			return
		}
		var lines bytes.Buffer
		for _, rs := range request.GetResourceSpans() {
			service, _ := attributes(rs.GetResource().GetAttributes())["service.name"].(string)
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					record := span{
						Service:      service,
						Scope:        ss.GetScope().GetName(),
						TraceID:      hex.EncodeToString(s.GetTraceId()),
						SpanID:       hex.EncodeToString(s.GetSpanId()),
						ParentSpanID: hex.EncodeToString(s.GetParentSpanId()),
						Name:         s.GetName(),
						Kind:         s.GetKind().String(),
						StartNanos:   s.GetStartTimeUnixNano(),
						EndNanos:     s.GetEndTimeUnixNano(),
						Attributes:   attributes(s.GetAttributes()),
						Links:        []link{},
						Status:       s.GetStatus().GetCode().String(),
						StatusText:   s.GetStatus().GetMessage(),
						Events:       []string{},
					}
					for _, l := range s.GetLinks() {
						record.Links = append(record.Links, link{
							TraceID: hex.EncodeToString(l.GetTraceId()),
							SpanID:  hex.EncodeToString(l.GetSpanId()),
						})
					}
					for _, e := range s.GetEvents() {
						record.Events = append(record.Events, e.GetName())
					}
					line, _ := json.Marshal(record)
					lines.Write(line)
					lines.WriteByte('\n')
				}
			}
		}
		mu.Lock()
		_, err = file.Write(lines.Bytes())
		mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// An empty ExportTraceServiceResponse.
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(nil)
	})

	listener, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("listening %s\n", listener.Addr())
	os.Stdout.Sync()
	log.Fatal(http.Serve(listener, nil))
}
