"""Research: experiments, dev-set builders and sweeps, outside the product package (not in the wheel)."""
