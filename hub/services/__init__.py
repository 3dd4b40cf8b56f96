"""Services combine domain rules with the store; adapters call these."""
