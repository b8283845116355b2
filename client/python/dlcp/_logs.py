"""The library's log lines through Python's `logging`, logger "dlcp".

The C++ library logs from its own threads, which must never wait for the GIL, so its lines are
queued in the extension and a daemon thread ("dlcp-log") hands them to the logger, with the
source file and line of the C++ statement as the record's filename and lineno.

- Level: the library logs what the "dlcp" logger's effective level lets through; the thread
  follows changes to it (logging.getLogger("dlcp").setLevel(...)) within half a second, and
  set_log_level() applies at once. The logger's level is INFO unless DLCP_LOG_LEVEL says otherwise
  or the program sets one.
- Where to: while no handler is configured for the logger or its parents (logging.basicConfig
  was never called), lines go to stderr as dlcpd writes them, as Python's last-resort handler
  would drop INFO; once one is, they go through `logging`.
"""
import atexit
import logging
import os
import threading

from . import _dlcp

logger = logging.getLogger("dlcp")

_BY_NUMBER = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
_BY_WORD = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING,
            "error": logging.ERROR}
_POLL_S = 0.5


def _library_word(level):
    """The library's least level for a `logging` level."""
    if level <= logging.DEBUG:
        return "debug"
    if level <= logging.INFO:
        return "info"
    return "warning" if level <= logging.WARNING else "error"


def set_log_level(level):
    """Sets the "dlcp" logger's level and the library's at once: "debug", "info", "warning",
    "error", or a `logging` level (logging.DEBUG). Raises ValueError for another word and TypeError
    for another type."""
    if isinstance(level, str):
        _dlcp.set_log_level(level)  # the library's parser: ValueError naming the word it does not know
        level = _BY_WORD[level.lower()]
    elif not isinstance(level, int) or isinstance(level, bool):
        raise TypeError(f"log level must be a str or a logging level int, not {type(level).__name__}")
    logger.setLevel(level)
    _forwarder.sync()


class _Forwarder:
    """The thread that takes queued lines and logs them."""

    def __init__(self):
        self._stop = threading.Event()
        self._thread = None
        self._word = None
        self._capturing = None

    def start(self):
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="dlcp-log", daemon=True)
        self._thread.start()

    def sync(self):
        """The library's level and destination, from the logger's level and handlers."""
        word = _library_word(logger.getEffectiveLevel())
        if word != self._word:
            _dlcp.set_log_level(word)
            self._word = word
        capturing = logger.hasHandlers()
        if capturing != self._capturing:
            _dlcp.capture_logs(capturing)
            self._capturing = capturing

    def stop(self):
        """At exit, after the clients closed: lines go to stderr again, and what is queued is logged."""
        self._stop.set()
        _dlcp.capture_logs(False)
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=2 * _POLL_S + 1)
        self._deliver(0.0)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.sync()
                self._deliver(_POLL_S)
            except Exception:  # a handler's failure must not end the thread; logging reports it
                logger.exception("dlcp: forwarding the library's log lines failed")
                self._stop.wait(_POLL_S)

    def _deliver(self, timeout_s):
        lines, dropped = _dlcp.next_log_lines(timeout_s)
        for number, file, line, message in lines:
            level = _BY_NUMBER[min(number, len(_BY_NUMBER) - 1)]
            if logger.isEnabledFor(level):
                logger.handle(logger.makeRecord(logger.name, level, file, line, message, (), None))
        if dropped:
            logger.warning("%d log lines of the dlcp library were dropped: the logging handlers did not keep up",
                           dropped)


_forwarder = _Forwarder()


def _start():
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)  # the library's default, as for dlcpd
    if os.environ.get("DLCP_LOG_LEVEL"):
        try:
            set_log_level(os.environ["DLCP_LOG_LEVEL"])
        except ValueError as e:
            raise ValueError(f"DLCP_LOG_LEVEL: {e}") from None
    _forwarder.sync()
    _forwarder.start()
    # Registered before the package's own exit handler, so it runs after the clients closed.
    atexit.register(_forwarder.stop)
    os.register_at_fork(after_in_child=_forwarder.start)  # the thread does not survive a fork
