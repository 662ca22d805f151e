/* ckpt_commands.h: the checkpoint commands of the megatrain executable.
 * argv holds the arguments after the command word (argv[0] is the first). */
#ifndef MT_CKPT_CKPT_COMMANDS_H
#define MT_CKPT_CKPT_COMMANDS_H

/* megatrain resume RUN_OR_CKPT_DIR [--set key.path=value ...]
 * Continue a run from its newest valid checkpoint (or the one named). */
int resume_main(int argc, char **argv);

/* megatrain inspect CKPT
 * List a checkpoint's tensors and verify every checksum (exit 1 on corruption). */
int inspect_main(int argc, char **argv);

#endif
