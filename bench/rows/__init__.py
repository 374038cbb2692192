"""The bench's rows, one module each; ``python -m bench --only ROWS`` picks them (bench/__main__.py)."""
