"""What one HTTP connection may hold, enforced below the application.

uvicorn alone waits forever for a request's head or body, accepts connections until the
process runs out of descriptors, and keeps writing to a client that stopped reading. This
package closes each of those before the request reaches the application:

* :mod:`app.connections.admission`: who may hold a connection (a global cap below the
  descriptor limit with a reserve for the health probes, a cap per client address,
  ``X-Forwarded-For`` read only from trusted proxies);
* :mod:`app.connections.protocol`: uvicorn's httptools protocol with deadlines (the request
  head, the body's minimum rate, the client's reading of the response) and a head size cap;
* :mod:`app.connections.refusals`: the answers it gives, in OpenAI's error shape.

``app.server`` builds the limits from the settings and serves with this protocol.
"""

from app.connections.admission import ConnectionGuard, ConnectionLimits
from app.connections.protocol import GuardedHttpProtocol

__all__ = ["ConnectionGuard", "ConnectionLimits", "GuardedHttpProtocol"]
