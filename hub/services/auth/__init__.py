"""Who is calling and what they may do: principals and API tokens (service.py: `Caller`, `AuthService`), the OAuth
server for hosted MCP clients (oauth.py, oauth_registration.py), Feishu identity links (identity.py) and credential
profiles with their encrypted values (credentials.py).

May import hub/domain, hub/store and the hub's base modules; no other service package (every one imports this)."""
