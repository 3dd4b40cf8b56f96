"""Persistence: SQLAlchemy Core tables, the engine factory and dialect differences."""
