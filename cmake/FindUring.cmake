# FindUring: liburing (Debian's liburing-dev) as the imported target Uring::Uring.
find_path(Uring_INCLUDE_DIR liburing.h)
find_library(Uring_LIBRARY NAMES uring)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Uring REQUIRED_VARS Uring_LIBRARY Uring_INCLUDE_DIR)
if(Uring_FOUND AND NOT TARGET Uring::Uring)
  add_library(Uring::Uring UNKNOWN IMPORTED)
  set_target_properties(Uring::Uring PROPERTIES IMPORTED_LOCATION "${Uring_LIBRARY}"
                                                INTERFACE_INCLUDE_DIRECTORIES "${Uring_INCLUDE_DIR}")
endif()
mark_as_advanced(Uring_INCLUDE_DIR Uring_LIBRARY)
