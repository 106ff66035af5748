# FindUring: liburing (Debian's liburing-dev) as the imported target Uring::Uring.
find_path(Uring_INCLUDE_DIR liburing.h)
find_library(Uring_LIBRARY NAMES uring)
include(${CMAKE_CURRENT_LIST_DIR}/ZeroImportedLibrary.cmake)
zero_imported_library(Uring)
