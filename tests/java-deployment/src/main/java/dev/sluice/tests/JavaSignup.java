package dev.sluice.tests;

import dev.restate.sdk.SharedWorkflowContext;
import dev.restate.sdk.WorkflowContext;
import dev.restate.sdk.annotation.Shared;
import dev.restate.sdk.annotation.Workflow;
import dev.restate.sdk.common.DurablePromiseKey;

/** Waits for `confirm` to resolve the `code` promise, then answers with it. */
@Workflow
public class JavaSignup {
  private static final DurablePromiseKey<String> CODE = DurablePromiseKey.of("code", String.class);

  @Workflow
  public String run(WorkflowContext ctx, String email) {
    String code = ctx.promise(CODE).future().await();
    return email + " confirmed with " + code;
  }

  @Shared
  public String confirm(SharedWorkflowContext ctx, String code) {
    ctx.promiseHandle(CODE).resolve(code);
    return "ok";
  }
}
