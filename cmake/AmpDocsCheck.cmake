# Script (cmake -P) behind amp_docs and its ctest: runs Doxygen, then fails on any warning and on
# public enumerators without documentation, which Doxygen 1.9.4 does not warn about.
# Usage: cmake -DDOXYGEN=<doxygen> -DDOXYFILE=<Doxyfile> -DXML_DIR=<xml output> -P AmpDocsCheck.cmake
foreach(_var DOXYGEN DOXYFILE XML_DIR)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "AmpDocsCheck.cmake: -D${_var}=... is required.")
  endif()
endforeach()

# Stale XML from an earlier run must not hide (or invent) an undocumented enumerator.
file(REMOVE_RECURSE "${XML_DIR}")
execute_process(COMMAND "${DOXYGEN}" "${DOXYFILE}"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0 OR _out MATCHES "warning:|error:" OR _err MATCHES "warning:|error:")
  message(FATAL_ERROR "Doxygen reported problems (exit status ${_rc}); fix each one in the "
    "header's /// comment:\n${_out}${_err}")
endif()

set(_undocumented "")
file(GLOB _xml_files "${XML_DIR}/*.xml")
foreach(_file IN LISTS _xml_files)
  file(READ "${_file}" _xml)
  string(REGEX MATCHALL
    "<enumvalue [^>]*prot=\"public\">[ \n]*<name>[A-Za-z0-9_]+</name>[ \n]*(<initializer>[^<]*</initializer>[ \n]*)?<briefdescription>[ \n]*</briefdescription>[ \n]*<detaileddescription>[ \n]*</detaileddescription>"
    _matches "${_xml}")
  foreach(_match IN LISTS _matches)
    string(REGEX REPLACE ".*<name>([A-Za-z0-9_]+)</name>.*" "\\1" _name "${_match}")
    get_filename_component(_compound "${_file}" NAME_WE)
    list(APPEND _undocumented "${_name} (in ${_compound})")
  endforeach()
endforeach()
if(_undocumented)
  list(JOIN _undocumented "\n  " _list)
  message(FATAL_ERROR "Public enumerators without a /// comment:\n  ${_list}")
endif()
message(STATUS "amp: API reference built without warnings")
