"""Each request's lifecycle, owned in one place (:class:`tracking.RequestTracker`): what it
may use, when it is prepared, admitted and run, and how it is settled however it ends. It
knows runs only by their protocol: no engine, no upstream."""
