//! OpenAPI
