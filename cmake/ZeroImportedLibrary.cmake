# zero_imported_library(<Package>)
# The end of a Find module of one header and one library: after find_path(<Package>_INCLUDE_DIR ...) and
# find_library(<Package>_LIBRARY ...), sets <Package>_FOUND (find_package_handle_standard_args) and
# defines the imported target <Package>::<Package>. A macro, so <Package>_FOUND reaches find_package.
macro(zero_imported_library package)
  include(FindPackageHandleStandardArgs)
  find_package_handle_standard_args(${package} REQUIRED_VARS ${package}_LIBRARY ${package}_INCLUDE_DIR)
  if(${package}_FOUND AND NOT TARGET ${package}::${package})
    add_library(${package}::${package} UNKNOWN IMPORTED)
    set_target_properties(${package}::${package} PROPERTIES IMPORTED_LOCATION "${${package}_LIBRARY}"
                                                             INTERFACE_INCLUDE_DIRECTORIES "${${package}_INCLUDE_DIR}")
  endif()
  mark_as_advanced(${package}_INCLUDE_DIR ${package}_LIBRARY)
endmacro()
