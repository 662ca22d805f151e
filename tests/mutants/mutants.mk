# mutants.mk: `make mutants` (included by the top Makefile; not part of CI):
# plants each one-line bug of tests/mutants/mutants.txt in a scratch copy of
# the tree (build/mutants), builds it, runs the tests listed for it, and fails
# when one survives (tests/mutants/run_mutants.sh). MUTANTS=NAME runs only the
# mutants whose name contains NAME.
.PHONY: mutants
mutants: deps
	@bash tests/mutants/run_mutants.sh $(MUTANTS)
