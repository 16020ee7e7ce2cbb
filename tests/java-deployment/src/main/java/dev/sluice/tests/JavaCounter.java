package dev.sluice.tests;

import dev.restate.sdk.ObjectContext;
import dev.restate.sdk.SharedObjectContext;
import dev.restate.sdk.annotation.Handler;
import dev.restate.sdk.annotation.Shared;
import dev.restate.sdk.annotation.VirtualObject;
import dev.restate.sdk.common.StateKey;

/** A count per object key, kept in its state. */
@VirtualObject
public class JavaCounter {
  private static final StateKey<Integer> COUNT = StateKey.of("count", Integer.class);

  /** Adds `by` to the count. */
  @Handler
  public int add(ObjectContext ctx, int by) {
    int total = ctx.get(COUNT).orElse(0) + by;
    ctx.set(COUNT, total);
    return total;
  }

  /** The count. */
  @Shared
  @Handler
  public int get(SharedObjectContext ctx) {
    return ctx.get(COUNT).orElse(0);
  }
}
