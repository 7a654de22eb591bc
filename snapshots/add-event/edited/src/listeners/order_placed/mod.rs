//! The listeners of `orderPlaced`: one module each.

// gpkit:begin modules
pub mod audit;
pub mod email;
// gpkit:end modules
