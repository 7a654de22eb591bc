// Command goosepeer runs migrations with the real goose v3.30.0 library, the
// way a Go service shares a database with gpkit's generated `migrate`: a
// goose.Provider over the pgx stdlib driver, with the Postgres session
// advisory lock (lock.NewPostgresSessionLocker), so that a goose run and a
// `migrate` run started together take turns.
//
// Usage:
//
//	goosepeer [-dir migrations] [-table goose_db_version] [-allow-missing] <db url> <command> [args]
//
// Commands: up, up-by-one, up-to V, down, down-to V, status, version.
// goose's own log lines go to stderr; the outcome is printed to stdout as
// one JSON document (see the types below). Errors exit with status 1.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// result is one migration run by up/down commands.
type result struct {
	Version   int64  `json:"version"`
	File      string `json:"file"`
	Direction string `json:"direction"`
	Empty     bool   `json:"empty"`
}

// status is one line of the status command.
type status struct {
	Version   int64  `json:"version"`
	File      string `json:"file"`
	State     string `json:"state"`                // "applied" or "pending"
	AppliedAt string `json:"applied_at,omitempty"` // RFC 3339, as read from tstamp
}

// version is the output of the version command. Version is what the goose
// CLI prints (`goose version`: the most recently applied version, from the
// legacy package API); MaxVersion is Provider.GetDBVersion (the highest).
type version struct {
	Version    int64 `json:"version"`
	MaxVersion int64 `json:"max_version"`
}

func main() {
	dir := flag.String("dir", "migrations", "directory with the migration files")
	table := flag.String("table", goose.DefaultTablename, "version table, optionally schema-qualified")
	allowMissing := flag.Bool("allow-missing", false, "apply missing (out-of-order) migrations")
	flag.Parse()
	if flag.NArg() < 2 {
		fmt.Fprintln(os.Stderr, "usage: goosepeer [-dir D] [-table T] [-allow-missing] <db url> <command> [args]")
		os.Exit(2)
	}
	opts := options{dir: *dir, table: *table, allowMissing: *allowMissing}
	out, err := run(context.Background(), opts, flag.Arg(0), flag.Arg(1), flag.Args()[2:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "goosepeer %s: %v\n", flag.Arg(1), err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// options are the command-line flags.
type options struct {
	dir          string
	table        string
	allowMissing bool
}

// The lines reportingLocker prints on stderr.
const (
	lockTakenAtOnce = "goosepeer: took goose's lock at once"
	lockHeldByOther = "goosepeer: goose's lock is held by another session; waiting for it"
)

// reportingLocker is goose's session locker, saying on stderr whether the
// lock was free, so that a test sees from this process, not from the clock,
// that a goose run met the lock of another. Before goose's own first try it
// tries the lock once itself on the same session: taken, it lets goose take
// it (advisory locks count per session, so goose's try succeeds at once) and
// drops its own count, leaving the lock as goose alone would hold it; held
// by another session, it says so and lets goose poll as it does.
type reportingLocker struct{ lock.SessionLocker }

func (l reportingLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	var free bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", lock.DefaultLockID).Scan(&free); err != nil {
		return err
	}
	if !free {
		fmt.Fprintln(os.Stderr, lockHeldByOther)
		return l.SessionLocker.SessionLock(ctx, conn)
	}
	fmt.Fprintln(os.Stderr, lockTakenAtOnce)
	if err := l.SessionLocker.SessionLock(ctx, conn); err != nil {
		return err
	}
	_, err := conn.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", lock.DefaultLockID)
	return err
}

// run opens the database and the provider and runs one command; it returns
// the value to print as JSON.
func run(ctx context.Context, opts options, url, command string, args []string) (any, error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return nil, err
	}
	defer db.Close()

	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, err
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS(opts.dir),
		goose.WithSessionLocker(reportingLocker{locker}),
		goose.WithTableName(opts.table),
		goose.WithAllowOutofOrder(opts.allowMissing),
		goose.WithVerbose(true),
	)
	if err != nil {
		return nil, err
	}

	switch command {
	case "up":
		return results(provider.Up(ctx))
	case "up-by-one":
		return one(provider.UpByOne(ctx))
	case "up-to":
		target, err := versionArg(args)
		if err != nil {
			return nil, err
		}
		return results(provider.UpTo(ctx, target))
	case "down":
		return one(provider.Down(ctx))
	case "down-to":
		target, err := versionArg(args)
		if err != nil {
			return nil, err
		}
		return results(provider.DownTo(ctx, target))
	case "status":
		return statuses(provider.Status(ctx))
	case "version":
		return versions(ctx, provider, db, opts.table)
	}
	return nil, fmt.Errorf("unknown command %q", command)
}

// versionArg parses the single VERSION argument of up-to and down-to.
func versionArg(args []string) (int64, error) {
	if len(args) != 1 {
		return 0, errors.New("expected one VERSION argument")
	}
	return strconv.ParseInt(args[0], 10, 64)
}

// results converts goose's migration results for printing.
func results(in []*goose.MigrationResult, err error) ([]result, error) {
	if err != nil {
		return nil, err
	}
	out := []result{}
	for _, r := range in {
		out = append(out, result{
			Version:   r.Source.Version,
			File:      filepath.Base(r.Source.Path),
			Direction: r.Direction,
			Empty:     r.Empty,
		})
	}
	return out, nil
}

// one is results for the commands that run a single migration.
func one(r *goose.MigrationResult, err error) ([]result, error) {
	if err != nil {
		return nil, err
	}
	return results([]*goose.MigrationResult{r}, nil)
}

// statuses converts goose's status lines for printing.
func statuses(in []*goose.MigrationStatus, err error) ([]status, error) {
	if err != nil {
		return nil, err
	}
	out := []status{}
	for _, s := range in {
		line := status{
			Version: s.Source.Version,
			File:    filepath.Base(s.Source.Path),
			State:   string(s.State),
		}
		if s.State == goose.StateApplied {
			line.AppliedAt = s.AppliedAt.Format(time.RFC3339Nano)
		}
		out = append(out, line)
	}
	return out, nil
}

// versions reads the current version both ways goose knows: the CLI's
// (legacy API) and the Provider's.
func versions(ctx context.Context, provider *goose.Provider, db *sql.DB, table string) (version, error) {
	maxVersion, err := provider.GetDBVersion(ctx)
	if err != nil {
		return version{}, err
	}
	if err := goose.SetDialect(string(goose.DialectPostgres)); err != nil {
		return version{}, err
	}
	goose.SetTableName(table)
	current, err := goose.GetDBVersionContext(ctx, db)
	if err != nil {
		return version{}, err
	}
	return version{Version: current, MaxVersion: maxVersion}, nil
}
