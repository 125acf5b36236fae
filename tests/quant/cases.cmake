# core/numerics/quant's reference tables (tests/quant/*.rle, fp32_cases.txt, blocks.txt) regenerated with this
# route's reference Python and compared with the committed ones. Skipped (77) where that torch has no
# float8 dtypes (Debian's torch 1.13): the unit tests [quant] still check mpt against the committed tables.
# blocks.txt is regenerated with torchao 0.18.0 (pinned in scripts/torch2-requirements.txt); on a torch
# with float8 dtypes the test fails where torchao cannot be imported.
add_test(NAME quant.tables
         COMMAND ${MPT_REF_PYTHON} -W ignore ${CMAKE_CURRENT_SOURCE_DIR}/quant/make_tables.py --check ${CMAKE_CURRENT_SOURCE_DIR}/quant
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(quant.tables PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
