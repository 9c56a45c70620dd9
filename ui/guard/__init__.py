"""What every request passes before it reaches the page's server: one reading of the request, and the rules
decided on it (host names, the page's own origin, the routes the app answers, logins and what each login holds,
uploads, how files are served). The middleware is ui/guard/middleware.py; its docstring lists the rules in order."""
from ui.guard.holdings import Holdings
from ui.guard.hosts import HostAllowList, host_of
from ui.guard.middleware import Guard
from ui.guard.throttle import FREE_LOGIN_TRIES, LoginThrottle

__all__ = ["FREE_LOGIN_TRIES", "Guard", "Holdings", "HostAllowList", "LoginThrottle", "host_of"]
