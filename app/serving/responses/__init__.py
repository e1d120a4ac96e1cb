"""The Responses API on the chat path: a Responses request runs as the chat request it
translates to (:mod:`app.serving.preparation.responses`); what the chat service answers is
read back into a Response (:mod:`.output`) or its stream of events (:mod:`.events`), and
stored (:mod:`.service`)."""
