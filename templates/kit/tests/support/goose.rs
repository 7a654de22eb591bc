//! What the tests of the goose-compatible migrations share: a database
//! known by its URL, and a migration directory of a test's own.

use std::path::{Path, PathBuf};

use sqlx::{Connection, Executor, PgConnection};

/// A database created for one test, dropped `WITH (FORCE)` on drop.
pub struct Database {
    pub url: String,
    pub admin_url: String,
    pub name: String,
}

impl Database {
    pub async fn new() -> Self {
        let db = Self::not_created("migrate_test");
        let mut admin = PgConnection::connect(&db.admin_url)
            .await
            .expect("connect to DATABASE_URL");
        admin
            .execute(format!(r#"CREATE DATABASE "{}""#, db.name).as_str())
            .await
            .expect("create the test database");
        admin.close().await.ok();
        db
    }

    /// A database name starting with `prefix` that no database has yet; it
    /// is dropped on drop if a test creates it.
    pub fn not_created(prefix: &str) -> Self {
        let admin_url = std::env::var("DATABASE_URL").expect(
            "these tests need a Postgres server: set DATABASE_URL, \
             e.g. postgres://postgres@127.0.0.1:5432/postgres",
        );
        let name = format!("{prefix}_{}", uuid::Uuid::now_v7().simple());
        let mut url = url::Url::parse(&admin_url).expect("DATABASE_URL is a URL");
        url.set_path(&name);
        Self {
            url: url.to_string(),
            admin_url,
            name,
        }
    }

    /// Whether the database exists on the server.
    pub async fn exists(&self) -> bool {
        let mut admin = PgConnection::connect(&self.admin_url)
            .await
            .expect("connect to DATABASE_URL");
        let (exists,): (bool,) =
            sqlx::query_as("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(&self.name)
                .fetch_one(&mut admin)
                .await
                .expect("look the database up");
        exists
    }

    pub async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.url)
            .await
            .expect("connect to the test database")
    }

    /// `SELECT count(*)` of a query's rows.
    pub async fn count(&self, sql: &str) -> i64 {
        let (count,): (i64,) = sqlx::query_as(&format!("SELECT count(*) FROM ({sql}) AS q"))
            .fetch_one(&mut self.connect().await)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        count
    }

    pub async fn table_exists(&self, table: &str) -> bool {
        let (exists,): (bool,) = sqlx::query_as("SELECT to_regclass($1) IS NOT NULL")
            .bind(table)
            .fetch_one(&mut self.connect().await)
            .await
            .expect("check a table");
        exists
    }

    /// The version table's `version_id`s in insertion order.
    pub async fn versions(&self) -> Vec<i64> {
        sqlx::query_as::<_, (i64,)>("SELECT version_id FROM goose_db_version ORDER BY id")
            .fetch_all(&mut self.connect().await)
            .await
            .expect("read the version table")
            .into_iter()
            .map(|(v,)| v)
            .collect()
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        // Quoted as an identifier: a test's name may hold a quote.
        let name = std::mem::take(&mut self.name).replace('"', r#""""#);
        // Drop runs inside the test's runtime, which cannot block on async work;
        // a separate thread with its own runtime can.
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(async move {
                    let mut admin = PgConnection::connect(&admin_url).await?;
                    admin
                        .execute(
                            format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#).as_str(),
                        )
                        .await?;
                    admin.close().await
                })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: failed to drop a test database");
        }
    }
}

/// A migration directory for one test, removed on drop.
pub struct MigrationDir(PathBuf);

impl MigrationDir {
    pub fn new(files: &[(&str, &str)]) -> Self {
        let path =
            std::env::temp_dir().join(format!("migrate-test-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&path).expect("create the migration directory");
        let dir = Self(path);
        for (name, sql) in files {
            dir.add(name, sql);
        }
        dir
    }

    pub fn add(&self, name: &str, sql: &str) {
        std::fs::write(self.0.join(name), sql).expect("write a migration");
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for MigrationDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub const ONE: &str = "-- +goose Up
CREATE TABLE one (id int PRIMARY KEY);

-- +goose Down
DROP TABLE one;
";

pub const TWO: &str = "-- +goose Up
INSERT INTO one (id) VALUES (1), (2);
-- +goose StatementBegin
CREATE FUNCTION two() RETURNS int AS $$
BEGIN
    RETURN 2;
END;
$$ LANGUAGE plpgsql;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION two();
DELETE FROM one;
";

pub const THREE: &str = "-- +goose Up
CREATE TABLE three (id int);
-- +goose Down
DROP TABLE three;
";

pub fn three_files() -> MigrationDir {
    MigrationDir::new(&[
        ("00001_one.sql", ONE),
        ("00002_two.sql", TWO),
        ("00003_three.sql", THREE),
    ])
}
