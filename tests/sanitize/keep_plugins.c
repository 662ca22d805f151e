/* keep_plugins.c: an LD_PRELOAD library of tests/run_sanitize.sh whose dlclose keeps every library
 * loaded. Open MPI unloads its plugins (mca_*.so) at MPI_Finalize; LeakSanitizer would then report
 * what they allocated against an unknown module, which no suppression can name. Kept loaded, they
 * are named, and tests/sanitize/lsan.supp leaves them out. Never linked into megatrain. */
int dlclose(void *handle);

int dlclose(void *handle) {
    (void)handle;
    return 0;
}
