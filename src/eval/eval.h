/* eval.h: `megatrain eval CKPT --data PREFIX`: the mean next-token loss of a
 * checkpoint's model over a fixed number of batches of a dataset. */
#ifndef MT_EVAL_EVAL_H
#define MT_EVAL_EVAL_H

/* argv after "eval" (argv[0] = the first argument). Returns the exit status:
 * 0, 1 (an unreadable checkpoint or dataset) or 2 (usage, a checkpoint directory or --data PREFIX.idx that
 * is not there among it). */
int eval_main(int argc, char **argv);

#endif
