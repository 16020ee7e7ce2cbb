package dev.sluice.tests;

import dev.restate.sdk.Awakeable;
import dev.restate.sdk.Context;
import dev.restate.sdk.annotation.Handler;
import dev.restate.sdk.annotation.Service;
import dev.sluice.scope.Scoped;
import java.time.Duration;
import java.util.Map;

/** Counts what the tests measure in this process: handlers holding at once, side effects. */
@Service
public class JavaMeter {
  private static final Object LOCK = new Object();
  private static int holding;
  private static int mostHolding;
  private static int effects;
  private static String lastAwakeable = "";

  /** Holds for `millis` (not durably: the slot stays taken), counting how many hold at once. */
  @Handler
  public int hold(Context ctx, int millis) throws InterruptedException {
    synchronized (LOCK) {
      holding++;
      mostHolding = Math.max(mostHolding, holding);
    }
    try {
      Thread.sleep(millis);
    } finally {
      synchronized (LOCK) {
        holding--;
      }
    }
    return millis;
  }

  /** The most `hold`s seen at once since the last `peak`; counting starts again. */
  @Handler
  public int peak(Context ctx) {
    synchronized (LOCK) {
      int seen = mostHolding;
      mostHolding = 0;
      return seen;
    }
  }

  /**
   * One side effect in `ctx.run`, then a durable sleep of `millis`: the effect is journaled
   * before the sleep, so an attempt that resumes after it replays it and never repeats it.
   */
  @Handler
  public Map<String, Integer> runOnce(Context ctx, int millis) {
    int seen =
        ctx.run(
            "effect",
            Integer.class,
            () -> {
              synchronized (LOCK) {
                return ++effects;
              }
            });
    ctx.sleep(Duration.ofMillis(millis));
    synchronized (LOCK) {
      return Map.of("seen", seen, "effects", effects);
    }
  }

  /**
   * Reports `amount` as what it spent (`ctx.run` steps named `sluice:cost`), in two steps around
   * a durable sleep, and answers it.
   */
  @Handler
  public long spend(Context ctx, long amount) {
    long first = amount / 2;
    ctx.run("sluice:cost", Long.class, () -> first);
    ctx.sleep(Duration.ofMillis(20));
    ctx.run("sluice:cost", Long.class, () -> amount - first);
    return amount;
  }

  /** How many side effects `runOnce` made in this process. */
  @Handler
  public int effects(Context ctx) {
    synchronized (LOCK) {
      return effects;
    }
  }

  /** Waits until an awakeable is resolved, and answers its value. */
  @Handler
  public String awaitAwakeable(Context ctx) {
    Awakeable<String> awakeable = ctx.awakeable(String.class);
    synchronized (LOCK) {
      lastAwakeable = awakeable.id();
    }
    return awakeable.await();
  }

  /**
   * Sends `count` `hold(300)` calls into scope `jv`, alternating limit keys `k0` and `k1`,
   * through the project's `Scoped` (the headers Sluice reads on V6 commands: this SDK has no
   * scope fields); answers how many.
   */
  @Handler
  public int fanOut(Context ctx, int count) {
    for (int i = 0; i < count; i++) {
      ctx.send(Scoped.scope(JavaMeterHandlers.hold(300), "jv", "k" + (i % 2)));
    }
    return count;
  }

  /** The scope and limit key this call runs under, as its input's headers say (`scope/key`). */
  @Handler
  public String whoAmI(Context ctx) {
    return Scoped.scopeOf(ctx.request()).orElse("-")
        + "/"
        + Scoped.limitKeyOf(ctx.request()).orElse("-");
  }

  /** Calls `whoAmI` without naming a scope: the child inherits this call's scope and key. */
  @Handler
  public String childWhoAmI(Context ctx) {
    return ctx.call(JavaMeterHandlers.whoAmI()).await();
  }

  /** The newest awakeable `awaitAwakeable` waits on. */
  @Handler
  public String lastAwakeable(Context ctx) {
    synchronized (LOCK) {
      return lastAwakeable;
    }
  }
}
