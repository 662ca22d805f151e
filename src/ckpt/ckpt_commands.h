/* ckpt_commands.h: the checkpoint command of the megatrain executable
 * (`resume`, which runs the training loop, is in src/train/train.h).
 * argv holds the arguments after the command word (argv[0] is the first). */
#ifndef MT_CKPT_CKPT_COMMANDS_H
#define MT_CKPT_CKPT_COMMANDS_H

/* megatrain inspect CKPT
 * List a checkpoint's tensors and verify every checksum (exit 1 on corruption). */
int inspect_main(int argc, char **argv);

#endif
