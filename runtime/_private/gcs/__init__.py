"""The Global Control Store: cluster control state, pub/sub, and (later) global scheduling."""
