//! Policy: limit parsing, sandbox plans and narrowing. Pure: no I/O.
