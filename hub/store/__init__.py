"""Persistence: SQLAlchemy Core tables, the engine factory and dialect differences; all of the hub's SQL.

May import hub/domain and the base modules; nothing above the store imports SQLAlchemy or its tables."""
