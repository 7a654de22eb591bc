//! Whether a documentation example that needs Postgres may run
//! ([`example_has_a_database`]): the one skip rule of the kit's examples.

use super::database::SERVER_VARIABLES;

/// `true` when `TEST_DATABASE_URL` or `DATABASE_URL` names a Postgres
/// server, for a documentation example that needs one:
///
/// ```text
/// # if !kit::testing::example_has_a_database() { return; }
/// ```
///
/// An example that returns early proves nothing, so without a server it
/// panics under CI (`CI=true`), naming the variable to set; elsewhere it
/// says on stderr that the example is skipped, and returns `false`.
pub fn example_has_a_database() -> bool {
    let named = SERVER_VARIABLES
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|url| !url.is_empty()));
    if named {
        return true;
    }
    // The test harness names the example that fails or prints this.
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "this example of kit::testing needs a Postgres server, and neither DATABASE_URL nor \
         TEST_DATABASE_URL is set, under CI=true\n\
         help: set DATABASE_URL=postgres://postgres@localhost:5432/postgres \
         (gpkit's scripts/with-services sets it)"
    );
    eprintln!(
        "skipped: this example of kit::testing needs a Postgres server: set DATABASE_URL \
         (or TEST_DATABASE_URL)"
    );
    false
}
