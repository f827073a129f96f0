# weightcast_settle_feature(<option> <label> <mode> <missing> <out_var>): settles an optional
# feature set to AUTO or ON once its requirements have been looked up. With <missing> empty it sets
# <out_var> TRUE. Otherwise ON stops the configure step naming what is missing, and AUTO says
# "weightcast: <label> OFF (AUTO; missing: ...)" and sets <out_var> FALSE.
function(weightcast_settle_feature option label mode missing out_var)
  if(NOT missing)
    set(${out_var} TRUE PARENT_SCOPE)
    return()
  endif()
  if(mode STREQUAL "ON")
    message(FATAL_ERROR "${option}=ON but not found: ${missing}")
  endif()
  message(STATUS "weightcast: ${label} OFF (AUTO; missing: ${missing})")
  set(${out_var} FALSE PARENT_SCOPE)
endfunction()
