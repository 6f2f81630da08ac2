# Convenience targets; each one does its own set-up.
.PHONY: setup test lint quickstart clean

setup:
	bash scripts/setup.sh dev,eval

test:
	bash scripts/test.sh

lint:
	bash scripts/lint.sh

quickstart:
	bash launch/pretrain.sh

clean:
	rm -rf .venv data/cache runs .pytest_cache .ruff_cache
