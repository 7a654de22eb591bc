// Command asynqpeer is a Go service on Go asynq v0.26.0, as gp-system's Go
// kit builds it, for gpkit's interop tests (tests/cli/asynq_interop.rs):
// the Rust worker and this program share one Valkey and one queue.
//
// It talks to the Valkey at $VALKEY_ADDR and prints one JSON object per
// line on stdout, for the tests to parse; asynq's own logs go to stderr.
//
//	asynqpeer serve [flags]          an asynq.Server with a ServeMux (-quiet: count only)
//	asynqpeer enqueue [flags]        an asynq.Client enqueuing stdin's envelopes
//	asynqpeer info <queue> <id>...   Inspector.GetTaskInfo, one line per id
//	asynqpeer list <queue> <state>   Inspector.List{Pending,...,Completed}Tasks
//	asynqpeer queue <queue>          Inspector.GetQueueInfo (task counts)
//	asynqpeer run <queue> <id>       Inspector.RunTask
//	asynqpeer pause|unpause <queue>  Inspector.PauseQueue, UnpauseQueue
//	asynqpeer cancel <id>            Inspector.CancelProcessing
//	asynqpeer servers                Inspector.Servers, one line per server
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
)

// Envelope is the Go kit's event envelope: the JSON payload of every
// `event:<name>` and `listener:<name>:<listener>` task. Its id is also the
// event task's id.
type Envelope struct {
	ID         uuid.UUID         `json:"id"`
	Name       string            `json:"name"`
	Payload    json.RawMessage   `json:"payload"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	OccurredAt time.Time         `json:"occurred_at"`
}

// out writes JSON lines to stdout, one whole line per call, from any goroutine.
var out = struct {
	sync.Mutex
	enc *json.Encoder
}{enc: json.NewEncoder(os.Stdout)}

func emit(v any) {
	out.Lock()
	defer out.Unlock()
	if err := out.enc.Encode(v); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "asynqpeer:", err)
	os.Exit(1)
}

// redisOpt connects to VALKEY_CLUSTER_ADDRS (comma-separated nodes of a
// cluster, Go asynq's RedisClusterClientOpt) when set, else to VALKEY_ADDR.
func redisOpt() asynq.RedisConnOpt {
	if nodes := os.Getenv("VALKEY_CLUSTER_ADDRS"); nodes != "" {
		return asynq.RedisClusterClientOpt{Addrs: strings.Split(nodes, ",")}
	}
	addr := os.Getenv("VALKEY_ADDR")
	if addr == "" {
		fatal(errors.New("VALKEY_ADDR is not set"))
	}
	return asynq.RedisClientOpt{Addr: addr}
}

func main() {
	if len(os.Args) < 2 {
		fatal(errors.New("usage: asynqpeer serve|enqueue|info|list|queue|run|pause|unpause|cancel|servers ..."))
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "serve":
		serve(args)
	case "enqueue":
		enqueue(args)
	case "info":
		info(args)
	case "list":
		list(args)
	case "queue":
		queue(args)
	case "run":
		run(args)
	case "pause", "unpause":
		pause(os.Args[1], args)
	case "cancel":
		cancel(args)
	case "servers":
		servers()
	default:
		fatal(fmt.Errorf("unknown command %q", os.Args[1]))
	}
}

// serve runs an asynq.Server until SIGTERM or SIGINT, then shuts it down
// as a Go service does (running handlers get -shutdown-timeout, then their
// tasks go back to pending). It prints {"event":"ready"} once started,
// {"event":"start"} when a handler begins, {"event":"done"} or
// {"event":"failed"} when it ends, and {"event":"stopped"} at exit.
//
// The handler of each -handle pattern decodes the envelope strictly into
// the Go kit's struct; its lines carry the task's headers. A payload note "sleep:<ms>" makes it take that long
// (less if the task's context ends); -fail makes every run fail with that
// message after decoding.
//
// With -quiet, for benchmarks (scripts/bench-outbox), the handler only
// decodes the envelope, as the Go kit's fan-out does for an event without
// listeners, and counts: no line per task (a task that is not an envelope
// still prints its "failed" line), no notes, no -fail. The "stopped" line
// then carries "handled" and "failed", the counts of handler runs.
func serve(args []string) {
	flags := flag.NewFlagSet("serve", flag.ExitOnError)
	queues := flags.String("queues", "default", "comma-separated queues served, equal weights")
	handle := flags.String("handle", "event:", "comma-separated ServeMux patterns to handle")
	concurrency := flags.Int("concurrency", 10, "handlers run at once")
	fail := flags.String("fail", "", "fail every run with this error message")
	shutdownTimeout := flags.Duration("shutdown-timeout", 8*time.Second, "asynq.Config.ShutdownTimeout")
	quiet := flags.Bool("quiet", false, "decode and count only: no line per task (for benchmarks)")
	_ = flags.Parse(args)

	weights := map[string]int{}
	for _, q := range strings.Split(*queues, ",") {
		weights[q] = 1
	}
	srv := asynq.NewServer(redisOpt(), asynq.Config{
		Concurrency:     *concurrency,
		Queues:          weights,
		ShutdownTimeout: *shutdownTimeout,
		LogLevel:        asynq.WarnLevel,
	})
	var counts taskCounts
	mux := asynq.NewServeMux()
	for _, pattern := range strings.Split(*handle, ",") {
		mux.HandleFunc(pattern, func(ctx context.Context, t *asynq.Task) error {
			if *quiet {
				return counts.handle(ctx, t)
			}
			return handleTask(ctx, t, *fail)
		})
	}
	if err := srv.Start(mux); err != nil {
		fatal(err)
	}
	emit(map[string]string{"event": "ready"})
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
	srv.Shutdown()
	if *quiet {
		emit(map[string]any{"event": "stopped",
			"handled": counts.handled.Load(), "failed": counts.failed.Load()})
		return
	}
	emit(map[string]string{"event": "stopped"})
}

// taskCounts is the handler of serve -quiet: it counts the runs that
// decoded an envelope (handled) and those that did not (failed).
type taskCounts struct {
	handled, failed atomic.Int64
}

// handle decodes the envelope strictly, as handleTask does, and counts;
// it prints a line only for a task that is not an envelope.
func (c *taskCounts) handle(ctx context.Context, t *asynq.Task) error {
	var envelope Envelope
	decoder := json.NewDecoder(bytes.NewReader(t.Payload()))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&envelope); err != nil {
		c.failed.Add(1)
		id, _ := asynq.GetTaskID(ctx)
		err = fmt.Errorf("not a Go kit envelope: %w", err)
		emit(map[string]any{"event": "failed", "id": id, "type": t.Type(), "error": err.Error()})
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	c.handled.Add(1)
	return nil
}

// handleTask is the ServeMux handler: it records the task as the Go kit
// sees it, with asynq.GetTaskID and the decoded envelope.
func handleTask(ctx context.Context, t *asynq.Task, fail string) error {
	id, _ := asynq.GetTaskID(ctx)
	queueName, _ := asynq.GetQueueName(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	record := map[string]any{
		"id": id, "type": t.Type(), "queue": queueName,
		"retried": retried, "max_retry": maxRetry, "headers": t.Headers(),
	}
	emit(map[string]any{"event": "start", "id": id, "type": t.Type()})

	var envelope Envelope
	decoder := json.NewDecoder(strings.NewReader(string(t.Payload())))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&envelope); err != nil {
		err = fmt.Errorf("not a Go kit envelope: %w", err)
		record["event"], record["error"] = "failed", err.Error()
		emit(record)
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	record["envelope"] = envelope

	var payload struct {
		Note string `json:"note"`
	}
	_ = json.Unmarshal(envelope.Payload, &payload)
	if ms, ok := strings.CutPrefix(payload.Note, "sleep:"); ok {
		n, _ := strconv.Atoi(ms)
		select {
		case <-time.After(time.Duration(n) * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err() // cut short: not recorded as done
		}
	}
	if fail != "" {
		record["event"], record["error"] = "failed", fail
		emit(record)
		return errors.New(fail)
	}
	record["event"] = "done"
	emit(record)
	return nil
}

// enqueueLine is one line of enqueue's stdin: an envelope to enqueue. A
// missing id gets a new UUID; a missing occurred_at is now.
type enqueueLine struct {
	ID         *uuid.UUID        `json:"id"`
	Payload    json.RawMessage   `json:"payload"`
	Metadata   map[string]string `json:"metadata"`
	OccurredAt *time.Time        `json:"occurred_at"`
	// Headers are the task's headers (asynq.NewTaskWithHeaders), such as
	// the traceparent a tracing middleware writes.
	Headers map[string]string `json:"headers"`
}

// enqueue reads envelopes as JSON lines on stdin and enqueues each as the
// Go kit does: task type -type, task id = envelope id, and the options of
// the flags, with the line's "headers" as the task's headers. It prints
// {"id", "result", "envelope"} per line, the result
// being "enqueued", "conflict" for a task id already in the queue
// (asynq.ErrTaskIDConflict) or "duplicate" for a unique task whose lock is
// held (asynq.ErrDuplicateTask); any other error stops it.
func enqueue(args []string) {
	flags := flag.NewFlagSet("enqueue", flag.ExitOnError)
	taskType := flags.String("type", "event:orderPlaced", "task type: event:<name> or listener:<name>:<listener>")
	queueName := flags.String("queue", "default", "asynq.Queue")
	maxRetry := flags.Int("max-retry", 25, "asynq.MaxRetry")
	timeout := flags.Duration("timeout", 30*time.Minute, "asynq.Timeout")
	retention := flags.Duration("retention", 24*time.Hour, "asynq.Retention")
	unique := flags.Duration("unique", 0, "asynq.Unique, if not 0")
	processIn := flags.Duration("process-in", 0, "asynq.ProcessIn, if not 0")
	_ = flags.Parse(args)
	options := []asynq.Option{asynq.Queue(*queueName), asynq.MaxRetry(*maxRetry),
		asynq.Timeout(*timeout), asynq.Retention(*retention)}
	if *unique > 0 {
		options = append(options, asynq.Unique(*unique))
	}
	if *processIn > 0 {
		options = append(options, asynq.ProcessIn(*processIn))
	}

	// The event name is the second part of the type in both conventions.
	parts := strings.Split(*taskType, ":")
	if len(parts) < 2 {
		fatal(fmt.Errorf("task type %q has no event name", *taskType))
	}
	client := asynq.NewClient(redisOpt())
	defer client.Close()

	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for scanner.Scan() {
		var line enqueueLine
		if err := json.Unmarshal(scanner.Bytes(), &line); err != nil {
			fatal(fmt.Errorf("bad input line %q: %w", scanner.Text(), err))
		}
		envelope := Envelope{
			ID: uuid.New(), Name: parts[1], Payload: line.Payload,
			Metadata: line.Metadata, OccurredAt: time.Now().UTC(),
		}
		if line.ID != nil {
			envelope.ID = *line.ID
		}
		if line.OccurredAt != nil {
			envelope.OccurredAt = *line.OccurredAt
		}
		body, err := json.Marshal(envelope)
		if err != nil {
			fatal(err)
		}
		taskOptions := append([]asynq.Option{asynq.TaskID(envelope.ID.String())}, options...)
		_, err = client.Enqueue(asynq.NewTaskWithHeaders(*taskType, body, line.Headers), taskOptions...)
		result := "enqueued"
		switch {
		case errors.Is(err, asynq.ErrTaskIDConflict):
			result = "conflict"
		case errors.Is(err, asynq.ErrDuplicateTask):
			result = "duplicate"
		case err != nil:
			fatal(err)
		}
		emit(map[string]any{"id": envelope.ID, "result": result, "envelope": envelope})
	}
	if err := scanner.Err(); err != nil {
		fatal(err)
	}
}

// taskInfo is asynq.TaskInfo as JSON: durations in seconds, times as Unix
// seconds (0 when unset), the payload as text.
func taskInfo(t *asynq.TaskInfo) map[string]any {
	unix := func(at time.Time) int64 {
		if at.IsZero() {
			return 0
		}
		return at.Unix()
	}
	return map[string]any{
		"id": t.ID, "queue": t.Queue, "type": t.Type, "payload": string(t.Payload),
		"state": t.State.String(), "max_retry": t.MaxRetry, "retried": t.Retried,
		"last_err": t.LastErr, "last_failed_at": unix(t.LastFailedAt),
		"timeout": t.Timeout.Seconds(), "retention": t.Retention.Seconds(),
		"completed_at": unix(t.CompletedAt), "next_process_at": unix(t.NextProcessAt),
		"is_orphaned": t.IsOrphaned,
	}
}

// info prints Inspector.GetTaskInfo of each id; a missing task prints
// {"id", "error": "task not found"}.
func info(args []string) {
	if len(args) < 2 {
		fatal(errors.New("usage: info <queue> <id>..."))
	}
	inspector := asynq.NewInspector(redisOpt())
	defer inspector.Close()
	for _, id := range args[1:] {
		t, err := inspector.GetTaskInfo(args[0], id)
		switch {
		case errors.Is(err, asynq.ErrTaskNotFound):
			emit(map[string]any{"id": id, "error": "task not found"})
		case errors.Is(err, asynq.ErrQueueNotFound):
			emit(map[string]any{"id": id, "error": "queue not found"})
		case err != nil:
			fatal(err)
		default:
			emit(taskInfo(t))
		}
	}
}

// list prints every task of one state of a queue, one line each.
func list(args []string) {
	if len(args) != 2 {
		fatal(errors.New("usage: list <queue> pending|active|retry|archived|completed"))
	}
	inspector := asynq.NewInspector(redisOpt())
	defer inspector.Close()
	lists := map[string]func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		"pending": inspector.ListPendingTasks, "active": inspector.ListActiveTasks,
		"retry": inspector.ListRetryTasks, "archived": inspector.ListArchivedTasks,
		"completed": inspector.ListCompletedTasks,
	}
	listFn, ok := lists[args[1]]
	if !ok {
		fatal(fmt.Errorf("unknown state %q", args[1]))
	}
	for page := 1; ; page++ {
		tasks, err := listFn(args[0], asynq.PageSize(1000), asynq.Page(page))
		if err != nil {
			fatal(err)
		}
		for _, t := range tasks {
			emit(taskInfo(t))
		}
		if len(tasks) < 1000 {
			return
		}
	}
}

// queue prints the task counts of Inspector.GetQueueInfo; processed and
// failed are today's (UTC), the _total ones all-time.
func queue(args []string) {
	if len(args) != 1 {
		fatal(errors.New("usage: queue <queue>"))
	}
	inspector := asynq.NewInspector(redisOpt())
	defer inspector.Close()
	q, err := inspector.GetQueueInfo(args[0])
	if err != nil {
		fatal(err)
	}
	emit(map[string]any{
		"queue": q.Queue, "pending": q.Pending, "active": q.Active,
		"scheduled": q.Scheduled, "retry": q.Retry, "archived": q.Archived,
		"completed": q.Completed, "processed": q.Processed, "failed": q.Failed,
		"processed_total": q.ProcessedTotal, "failed_total": q.FailedTotal,
	})
}

// run moves a retry, scheduled or archived task to pending (Inspector.RunTask).
func run(args []string) {
	if len(args) != 2 {
		fatal(errors.New("usage: run <queue> <id>"))
	}
	inspector := asynq.NewInspector(redisOpt())
	defer inspector.Close()
	if err := inspector.RunTask(args[0], args[1]); err != nil {
		fatal(err)
	}
	emit(map[string]string{"id": args[1], "result": "pending"})
}

// pause stops every server from dequeuing from a queue (Inspector.PauseQueue),
// or lets them again (UnpauseQueue).
func pause(command string, args []string) {
	if len(args) != 1 {
		fatal(fmt.Errorf("usage: %s <queue>", command))
	}
	inspector := asynq.NewInspector(redisOpt())
	defer inspector.Close()
	change := inspector.PauseQueue
	if command == "unpause" {
		change = inspector.UnpauseQueue
	}
	if err := change(args[0]); err != nil {
		fatal(err)
	}
	emit(map[string]string{"queue": args[0], "result": command + "d"})
}

// cancel asks the server running a task to cancel its context
// (Inspector.CancelProcessing, a message on the asynq:cancel channel).
func cancel(args []string) {
	if len(args) != 1 {
		fatal(errors.New("usage: cancel <id>"))
	}
	inspector := asynq.NewInspector(redisOpt())
	defer inspector.Close()
	if err := inspector.CancelProcessing(args[0]); err != nil {
		fatal(err)
	}
	emit(map[string]string{"id": args[0], "result": "cancel sent"})
}

// servers prints the servers that announce themselves (Inspector.Servers,
// what asynqmon's Servers page shows), with the tasks they run.
func servers() {
	inspector := asynq.NewInspector(redisOpt())
	defer inspector.Close()
	list, err := inspector.Servers()
	if err != nil {
		fatal(err)
	}
	for _, srv := range list {
		var workers []map[string]string
		for _, w := range srv.ActiveWorkers {
			workers = append(workers, map[string]string{
				"task_id": w.TaskID, "task_type": w.TaskType, "queue": w.Queue,
			})
		}
		emit(map[string]any{
			"id": srv.ID, "host": srv.Host, "pid": srv.PID, "concurrency": srv.Concurrency,
			"queues": srv.Queues, "status": srv.Status, "active_workers": workers,
		})
	}
}
