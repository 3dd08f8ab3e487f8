//! The MCP front: JSON-RPC 2.0 on stdio for agent hosts, confined, able only to ask the
//! monitor for the four requests its role allows.
