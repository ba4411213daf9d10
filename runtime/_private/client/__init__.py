"""Client mode (``lumos.init("lumos://HOST:PORT")``): a driver on a machine with no lumos node.

```
 client machine                         head node
 ┌───────────────────────┐   TCP    ┌──────────────────────────┐  fd   ┌───────────────────────────┐
 │ user code, lumos API  │ ───────► │ ClientServer (server.py) │ ────► │ session (session.py), one  │
 │ ClientWorker          │ ◄═══════════════════════════════════════════│ per client: a real driver  │
 │ (worker.py)           │   the same authenticated connection       │ core worker on the head    │
 └───────────────────────┘                                           └───────────────────────────┘
```
The client server (started by ``lumos start --head``) authenticates each connection
with the cluster token, reads its hello and hands the socket (``SCM_RIGHTS``) to the
client's session process, starting one for a new client. The session owns the client's
objects and tasks; the client holds stand-in refs it counts and releases over the
link. A link that breaks is reported (``ConnectionError`` naming the head) and
re-established within ``client_reconnect_grace_s``; a session whose client does not
come back within it shuts its driver down, which frees the client's objects and ends
its actors.
"""
