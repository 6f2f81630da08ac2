# Convenience targets; each one does its own set-up.
.PHONY: setup test test-quick lint quickstart clean

setup:
	bash scripts/setup.sh dev,eval

test:
	bash scripts/test.sh

test-quick:
	bash scripts/test.sh --quick

lint:
	bash scripts/lint.sh

quickstart:
	bash launch/pretrain.sh

clean:
	rm -rf .venv data/cache runs .pytest_cache .ruff_cache
