// libdlcp.so is dlcp_client linked whole (WHOLE_ARCHIVE exports every API symbol); CMake needs a
// source of the shared library's own, and this empty one is it.
