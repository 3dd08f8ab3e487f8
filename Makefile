# Convenience targets around the client SDKs (the Rust workspace builds with cargo).
#   make test-sdk          the three SDK suites against their stand-in APIs
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
