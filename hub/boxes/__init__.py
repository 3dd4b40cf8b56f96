"""Box drivers: where the machines claimed inside a lease task come from."""
