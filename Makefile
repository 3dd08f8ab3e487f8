# Convenience targets around the client SDKs (the Rust workspace builds with cargo).
#   make test-sdk          the three SDK suites against their stand-in APIs
#   make test-examples     the Node plugin host against a fake Zygo
#   make verify-plugin-host | verify-plugin-host-node | live-sdk   against a real Zygo
#   make test-sdk-python | test-sdk-node | test-sdk-elixir

PYTHON ?= python3
NODE ?= node
MIX ?= mix

.PHONY: test-sdk test-sdk-python test-sdk-node test-sdk-elixir

test-sdk: test-sdk-python test-sdk-node test-sdk-elixir

test-sdk-python:
	cd sdk/python && $(PYTHON) -m unittest discover -s tests -t .

test-sdk-node:
	cd sdk/node && $(NODE) --test test/

# MIX_ENV=test and no dependencies: mix never reaches for hex.
test-sdk-elixir:
	cd sdk/elixir && MIX_ENV=test $(MIX) test

# The plugin-host examples against a real Zygo of their own (scripts/with-api starts a
# supervisor and `zygo api`; build zygo first with cargo build).
.PHONY: verify-plugin-host verify-plugin-host-node test-examples live-sdk

verify-plugin-host:
	scripts/with-api sh -c 'cd examples/plugin-host && $(PYTHON) verify.py'

verify-plugin-host-node:
	scripts/with-api $(NODE) examples/plugin-host-node/verify.js

# The Node plugin host against a fake Zygo.
test-examples:
	cd examples/plugin-host-node && $(NODE) --test test/

# The SDKs' live suites against a real Zygo of their own.
live-sdk:
	sdk/live.sh
