"""Pure card rendering: view model → Feishu Card JSON 2.0; typed, versioned action payloads."""
