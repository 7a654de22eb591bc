// Command inspectpeer is Go asynq v0.26's view of a queue, for gpkit's
// interop tests: what asynqmon's Servers page lists, its Cancel button,
// a task as Go enqueues and inspects it, and the Schedulers page. Output is JSON on stdout.
//
// Usage (the Redis address first):
//
//	inspectpeer <addr> servers                   Inspector.Servers()
//	inspectpeer <addr> cancel <task id>          Inspector.CancelProcessing
//	inspectpeer <addr> enqueue <queue> <type> <task id> <payload>
//	inspectpeer <addr> task <queue> <task id>    Inspector.GetTaskInfo
//	inspectpeer <addr> schedulers                Inspector.SchedulerEntries()
//	inspectpeer <addr> history <entry id>        Inspector.ListSchedulerEnqueueEvents
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/hibiken/asynq"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "inspectpeer:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("usage: inspectpeer <addr> servers|cancel|enqueue|task ...")
	}
	redis := asynq.RedisClientOpt{Addr: args[0]}
	inspector := asynq.NewInspector(redis)
	defer inspector.Close()
	switch command, rest := args[1], args[2:]; {
	case command == "servers" && len(rest) == 0:
		servers, err := inspector.Servers()
		if err != nil {
			return err
		}
		if servers == nil {
			servers = []*asynq.ServerInfo{}
		}
		return print(servers)
	case command == "cancel" && len(rest) == 1:
		return inspector.CancelProcessing(rest[0])
	case command == "enqueue" && len(rest) == 4:
		client := asynq.NewClient(redis)
		defer client.Close()
		task := asynq.NewTask(rest[1], []byte(rest[3]))
		info, err := client.Enqueue(task, asynq.Queue(rest[0]), asynq.TaskID(rest[2]),
			asynq.MaxRetry(3), asynq.Timeout(30*time.Minute))
		if err != nil {
			return err
		}
		return print(map[string]string{"id": info.ID, "queue": info.Queue})
	case command == "task" && len(rest) == 2:
		info, err := inspector.GetTaskInfo(rest[0], rest[1])
		if err != nil {
			return err
		}
		return print(map[string]any{
			"id":       info.ID,
			"queue":    info.Queue,
			"type":     info.Type,
			"state":    info.State.String(),
			"retried":  info.Retried,
			"last_err": info.LastErr,
		})
	case command == "schedulers" && len(rest) == 0:
		entries, err := inspector.SchedulerEntries()
		if err != nil {
			return err
		}
		out := []map[string]any{}
		for _, entry := range entries {
			out = append(out, map[string]any{
				"id":   entry.ID,
				"spec": entry.Spec,
				"type": entry.Task.Type(),
				"next": entry.Next,
				"prev": entry.Prev,
			})
		}
		return print(out)
	case command == "history" && len(rest) == 1:
		events, err := inspector.ListSchedulerEnqueueEvents(rest[0], asynq.PageSize(1000))
		if err != nil {
			return err
		}
		out := []map[string]any{}
		for _, event := range events {
			out = append(out, map[string]any{"task_id": event.TaskID, "at": event.EnqueuedAt})
		}
		return print(out)
	default:
		return fmt.Errorf("unknown command %q with %d arguments", command, len(rest))
	}
}

func print(value any) error {
	return json.NewEncoder(os.Stdout).Encode(value)
}
