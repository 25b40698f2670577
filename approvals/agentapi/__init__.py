"""The agent API: agents outside Django gate calls over HTTP with an agent key.

:mod:`.objects` builds the approval object every answer carries; :mod:`.auth`
reads the bearer key; :mod:`.views` are the endpoints; :mod:`.waits` holds a
long-poll open without a thread, woken by the process listener.
"""
