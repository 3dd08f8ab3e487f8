//! MCP, as both fronts speak it: `zygo mcp` on stdio (crate `zygo-mcp`) and `zygo api` at
//! `/mcp` (Streamable HTTP, [`crate::http::handlers::mcp`]). One JSON-RPC reader, one
//! revision table, one set of tool schemas and argument parsers, so the two cannot drift:
//! what a tool accepts, and what it can never be asked for, is written here once.
//!
//! Everything here is pure: it turns untrusted JSON into [`tools::Call`] and replies into
//! tool results. Who carries a call out differs: the stdio front asks its monitor side with
//! `proto::mcp::McpRequest`, the HTTP front asks the supervisor with the same typed
//! `proto::front::Request`s as its other routes, as the caller its token names.

pub mod jsonrpc;
pub mod methods;
pub mod revision;
pub mod tools;
